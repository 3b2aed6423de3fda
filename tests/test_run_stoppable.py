"""run_stoppable (the wait of move-shard's and rebalance's main thread) under Ctrl-C pressed again and again: a
SIGINT may land at any instant of the wait, as often as the key is pressed, and must neither end the process nor
cut the work short. A wait on threading's Event broke when one landed inside its Condition's release and
re-acquire ("RuntimeError: release unlocked lock", the process killed mid-batch: seen in CI on a second Ctrl-C)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

PROGRAM = """
import sys, time
from pgidgen.move.steps.base import run_stoppable
seen = []
def work(stop):
    time.sleep(0.2)  # the main thread is in its wait by then
    print("ready", flush=True)
    t = time.monotonic()
    while time.monotonic() - t < 2.5:
        time.sleep(0.0005)
    return "finished"
result, interrupted = run_stoppable(work, on_interrupt=lambda: seen.append(1))
print(result, interrupted, len(seen), flush=True)
"""


def test_a_flood_of_sigints_neither_ends_the_wait_nor_the_work() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    sent = 0
    deadline = time.monotonic() + 1.5  # and then none: the work goes on a second longer, to its end
    while time.monotonic() < deadline and proc.poll() is None:
        os.kill(proc.pid, signal.SIGINT)
        sent += 1
        if sent % 50 == 0:
            time.sleep(0.0001 * (sent % 7))  # bursts at irregular times: the signals fall on every instant of a turn
    out, err = proc.communicate(timeout=60)
    assert sent > 500, sent
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert "Traceback" not in err, err
    assert out.split() == ["finished", "True", "1"], out  # the work ran to its end; the notice came once
