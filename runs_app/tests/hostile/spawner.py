"""Bounded process spawner: tries to start `attempts` children that sleep, reports how many started.

Never a real bomb: it stops after `attempts` tries or 20 refusals in a row, whichever comes first,
so even without any process limit it starts at most `attempts` sleepers (default 3000).
"""

import json
import subprocess
import sys

attempts = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
started, refused_in_a_row = [], 0
for _ in range(attempts):
    try:
        started.append(subprocess.Popen(["sleep", "30"]).pid)
        refused_in_a_row = 0
    except OSError:
        refused_in_a_row += 1
        if refused_in_a_row >= 20:
            break
print(json.dumps({"started": len(started), "pids": started}), flush=True)
