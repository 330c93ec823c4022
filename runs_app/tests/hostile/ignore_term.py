"""Ignores SIGTERM, reports it got it, then keeps running."""

import os
import signal
import sys
import time

# os.write, not print: the signal may land while the main code is inside print(), and a
# buffered write re-entered from a handler raises.
signal.signal(signal.SIGTERM, lambda *_: os.write(1, b"got SIGTERM, ignoring it\n"))
print("ready", flush=True)
for _ in range(600):  # bounded: 60 s at most
    time.sleep(0.1)
sys.exit(3)
