"""python -m pgidgen: the command line."""
from .cli import main

main(prog_name="pgidgen")
