import unittest

from lru import LRUCache


class LRUCacheTests(unittest.TestCase):
    def test_get_returns_stored_value(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        self.assertEqual(cache.get("a"), 1)
        self.assertIsNone(cache.get("missing"))
        self.assertEqual(cache.get("missing", 0), 0)

    def test_least_recently_used_key_is_evicted(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.get("a")  # "b" is now the least recently used
        cache.put("c", 3)
        self.assertNotIn("b", cache)
        self.assertEqual(cache.keys(), ["a", "c"])

    def test_capacity_must_be_positive(self):
        with self.assertRaises(ValueError):
            LRUCache(0)


if __name__ == "__main__":
    unittest.main()
