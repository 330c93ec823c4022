"""The embedded broker delivers every message exactly once while producers and consumers in
other processes race on its folder. kombu's own filesystem transport, in the same race, lost
about one message in twelve (a consumer read a file its producer had opened but not yet written:
kombu issue #1551); that lost message once left a CI run's worker short of trials."""

import multiprocessing
import queue
import time

from kombu import Connection, Exchange, Queue

from evalsite import filesystem_broker

TRANSPORT = "evalsite.filesystem_broker:Transport"
PRODUCERS, PER_PRODUCER, CONSUMERS = 2, 200, 3
# A message large enough that writing it takes a while, as a dispatch with a long payload would.
PADDING = "x" * 20_000
EXCHANGES = [f"race{n}" for n in range(4)]


def _produce(broker_dir, first):
    options = filesystem_broker.transport_options(broker_dir)
    with Connection("filesystem://", transport=TRANSPORT, transport_options=options) as connection:
        messages = connection.SimpleQueue("race")
        for number in range(first, first + PER_PRODUCER):
            messages.put({"number": number, "padding": PADDING})


def _consume(broker_dir, received, total, results):
    numbers, failures = [], []
    deadline = time.monotonic() + 30
    try:
        options = filesystem_broker.transport_options(broker_dir)
        with Connection("filesystem://", transport=TRANSPORT, transport_options=options) as connection:
            messages = connection.SimpleQueue("race")  # binds the queue, racing the producers
            while received.value < total and time.monotonic() < deadline:
                try:
                    message = messages.get(block=False)
                except queue.Empty:
                    continue
                except Exception as exc:  # what kombu's transport raises on a half-written file
                    failures.append(repr(exc))
                    continue
                numbers.append(message.payload["number"])
                message.ack()
                with received.get_lock():
                    received.value += 1
    except Exception as exc:
        failures.append(repr(exc))
    results.put((numbers, failures))


def test_racing_producers_and_consumers_deliver_every_message_once(tmp_path):
    context = multiprocessing.get_context("fork")
    total = PRODUCERS * PER_PRODUCER
    received, results = context.Value("i", 0), context.Queue()
    consumers = [
        context.Process(target=_consume, args=(tmp_path, received, total, results)) for _ in range(CONSUMERS)
    ]
    producers = [
        context.Process(target=_produce, args=(tmp_path, k * PER_PRODUCER)) for k in range(PRODUCERS)
    ]
    for process in consumers + producers:
        process.start()
    outcomes = [results.get(timeout=60) for _ in consumers]
    for process in consumers + producers:
        process.join(timeout=10)

    numbers = [n for got, _ in outcomes for n in got]
    failures = [f for _, got in outcomes for f in got]
    assert failures == [] and [p.exitcode for p in producers] == [0] * PRODUCERS
    assert sorted(numbers) == list(range(total))
    assert [p.name for sub in ("in", "processed", "staging") for p in (tmp_path / sub).iterdir()] == []


def _bind(broker_dir, number, start, results):
    try:
        options = filesystem_broker.transport_options(broker_dir)
        with Connection("filesystem://", transport=TRANSPORT, transport_options=options) as connection:
            start.wait(10)
            for exchange in EXCHANGES:
                queue = Queue(f"q{number}", Exchange(exchange), routing_key=f"q{number}")
                queue(connection.default_channel).declare()
        results.put(None)
    except Exception as exc:
        results.put(repr(exc))


def test_queues_bound_at_once_to_one_exchange_are_all_bound(tmp_path):
    """Workers starting together each bind their queues: kombu's transport could read a table
    another process had just created empty, or truncate one it had just written."""
    context = multiprocessing.get_context("fork")
    binders, start, results = 12, context.Event(), context.Queue()
    processes = [context.Process(target=_bind, args=(tmp_path, n, start, results)) for n in range(binders)]
    for process in processes:
        process.start()
    start.set()
    failures = [failure for failure in (results.get(timeout=30) for _ in processes) if failure]
    for process in processes:
        process.join(timeout=10)

    assert failures == []
    options = filesystem_broker.transport_options(tmp_path)
    with Connection("filesystem://", transport=TRANSPORT, transport_options=options) as connection:
        tables = {e: {b.queue for b in connection.default_channel.get_table(e)} for e in EXCHANGES}
    assert tables == {e: {f"q{n}" for n in range(binders)} for e in EXCHANGES}
