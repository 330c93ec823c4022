import unittest

from shipping import shipping_cost


class ShippingCostTests(unittest.TestCase):
    def test_small_domestic_parcel(self):
        self.assertEqual(shipping_cost(0.8, "domestic"), 4.5)

    def test_heavy_eu_parcel_pays_per_extra_kg(self):
        self.assertEqual(shipping_cost(7, "eu"), 19.0)

    def test_express_world(self):
        self.assertEqual(shipping_cost(3, "world", express=True), 50.0)

    def test_unknown_zone(self):
        with self.assertRaises(ValueError):
            shipping_cost(1, "mars")

    def test_weight_must_be_positive(self):
        with self.assertRaises(ValueError):
            shipping_cost(0, "eu")


if __name__ == "__main__":
    unittest.main()
