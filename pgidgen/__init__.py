"""pgidgen: Instagram-style sharded 64-bit IDs for PostgreSQL."""
from __future__ import annotations

__version__ = "0.1.0"
