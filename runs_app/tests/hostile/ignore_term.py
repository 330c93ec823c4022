"""Ignores SIGTERM, reports it got it, then keeps running."""

import signal
import sys
import time

signal.signal(signal.SIGTERM, lambda *_: print("got SIGTERM, ignoring it", flush=True))
print("ready", flush=True)
for _ in range(600):  # bounded: 60 s at most
    time.sleep(0.1)
sys.exit(3)
