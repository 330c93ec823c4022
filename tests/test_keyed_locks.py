"""evalsite.keyed_locks: one computation for many askers, kept a while."""

import threading
import time

from evalsite.keyed_locks import Recent


def test_many_threads_asking_for_one_key_compute_it_once_and_share_the_result():
    kept = Recent(60.0)
    calls = []

    def compute():
        calls.append(1)
        time.sleep(0.05)
        return object()

    results = []
    threads = [threading.Thread(target=lambda: results.append(kept.get("k", compute))) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(calls) == 1 and len(results) == 20 and len({id(r) for r in results}) == 1


def test_a_kept_result_expires_and_the_oldest_go_first_past_the_size():
    kept = Recent(0.05, size=2)
    assert kept.get("a", lambda: 1) == 1
    assert kept.get("a", lambda: 2) == 1  # still kept
    time.sleep(0.06)
    assert kept.get("a", lambda: 3) == 3  # expired: computed again
    kept.get("b", lambda: "b")
    kept.get("c", lambda: "c")  # "a" was the oldest of three
    assert kept.get("a", lambda: 4) == 4 and kept.get("c", lambda: 5) == "c"
