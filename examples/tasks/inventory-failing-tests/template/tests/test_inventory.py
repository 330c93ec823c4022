import unittest

from inventory import Inventory, OutOfStock


class InventoryTests(unittest.TestCase):
    def setUp(self):
        self.inv = Inventory()

    def test_skus_are_case_insensitive(self):
        self.inv.add("ab-1", 2)
        self.inv.add(" AB-1 ", 3)
        self.assertEqual(self.inv.quantity("Ab-1"), 5)

    def test_removing_everything_is_allowed(self):
        self.inv.add("X", 4)
        self.assertEqual(self.inv.remove("x", 4), 0)

    def test_removing_too_much_raises(self):
        self.inv.add("X", 1)
        with self.assertRaises(OutOfStock):
            self.inv.remove("X", 2)

    def test_empty_skus_disappear(self):
        self.inv.add("A", 1)
        self.inv.add("B", 1)
        self.inv.remove("A", 1)
        self.assertEqual(self.inv.skus(), ["B"])

    def test_low_stock_includes_the_threshold(self):
        self.inv.add("A", 5)
        self.inv.add("B", 6)
        self.inv.add("C", 1)
        self.assertEqual(self.inv.low_stock(5), ["A", "C"])

    def test_add_rejects_zero(self):
        with self.assertRaises(ValueError):
            self.inv.add("A", 0)


if __name__ == "__main__":
    unittest.main()
