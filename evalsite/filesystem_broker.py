"""The embedded broker: kombu's filesystem transport, with messages that appear whole and are
taken by one consumer only.

kombu's own transport opens a message's file in the queue folder and then writes it, and its
consumer reads whatever is there: a consumer that lists the folder in between reads an empty
file, fails to decode it and has already deleted it, so the message is lost (kombu issue #1551).
It also moves a taken message to the system temp folder with `shutil.move`, which copies when
that is another filesystem, so two consumers can both take one message. Its exchange tables (which
queue a routing key reaches) have the same gap: a process binding a queue creates the table's
file empty and then locks it, and one that binds or routes in between reads an empty file and
fails, which stopped a consumer from starting in this project's own tests.

Here a message is written in a staging folder beside the queue and renamed into it, and a
consumer takes one by renaming it into the processed folder: both renames stay on the broker
folder's filesystem, so each is atomic and exactly one consumer wins. An exchange table is read
and changed under its lock, and an empty file is a table with no bindings yet.
"""

import fcntl
import os
import uuid
from pathlib import Path
from queue import Empty
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property

FOLDERS = ("in", "processed", "control", "staging")


def transport_options(broker_dir: Path) -> dict:
    """The transport's folders under `broker_dir`, made if missing (absolute: a worker's
    working folder is not the web process's)."""
    for sub in FOLDERS:
        (broker_dir / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(broker_dir / "in"),
        "data_folder_out": str(broker_dir / "in"),
        "processed_folder": str(broker_dir / "processed"),
        "control_folder": str(broker_dir / "control"),
        "staging_folder": str(broker_dir / "staging"),
        # No store_processed: a taken message is always deleted once read (Channel._get).
        "polling_interval": 0.1,
    }


class Channel(filesystem.Channel):
    @cached_property
    def staging_folder(self):
        return self.transport_options["staging_folder"]

    def _put(self, queue, payload, **kwargs):
        # The name sorts by time, as kombu's does: _get takes the oldest first.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        staged = os.path.join(self.staging_folder, name)
        try:
            with open(staged, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.rename(staged, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add message {name!r} to the broker folder") from exc

    def get_table(self, exchange):
        try:
            with open(self._exchange_file(exchange), "rb") as f:
                fcntl.flock(f, fcntl.LOCK_SH)
                return _bindings(f.read())
        except FileNotFoundError:
            return []

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._change_table(
            exchange, lambda bindings: bindings if binding in bindings else [binding, *bindings]
        )

    def _delete(self, queue, exchange, routing_key, pattern, *args, **kwargs):
        # The virtual channel forgets the queue; kombu's filesystem override is what is replaced.
        super(filesystem.Channel, self)._delete(queue, exchange, routing_key, pattern, *args, **kwargs)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._change_table(exchange, lambda bindings: [b for b in bindings if b != binding], create=False)

    def _change_table(self, exchange, change, create=True):
        file = self._exchange_file(exchange)
        try:
            # Opened without truncating, so a table another process wrote is never emptied.
            fd = os.open(file, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            return
        with open(fd, "r+b", buffering=0) as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            bindings = _bindings(f.read())
            changed = change(bindings)
            if changed != bindings:
                f.seek(0)
                f.write(str_to_bytes(dumps(changed)))
                f.truncate()

    def _get(self, queue):
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            taken = os.path.join(self.processed_folder, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except FileNotFoundError:
                continue  # another consumer took it first
            try:
                with open(taken, "rb") as f:
                    payload = f.read()
                os.remove(taken)
            except OSError as exc:
                raise ChannelError(f"Cannot read message {name!r} from the broker folder") from exc
            return loads(bytes_to_str(payload))
        raise Empty()


def _bindings(table: bytes) -> list:
    return [filesystem.exchange_queue_t(*b) for b in loads(bytes_to_str(table))] if table else []


class Transport(filesystem.Transport):
    Channel = Channel
