"""A small least-recently-used cache for API responses."""


class LRUCache:
    """Fixed-capacity mapping that evicts the least recently used key (contract in the task)."""

    def __init__(self, capacity: int):
        raise NotImplementedError
