import unittest

from stats import mean, median


class MeanTests(unittest.TestCase):
    def test_mean_of_two_numbers(self):
        self.assertEqual(mean([2, 4]), 3)

    def test_mean_of_floats(self):
        self.assertAlmostEqual(mean([0.5, 1.5, 2.5]), 1.5)

    def test_mean_of_single_value(self):
        self.assertEqual(mean([7]), 7)

    def test_mean_of_empty_list_raises(self):
        with self.assertRaises(ValueError):
            mean([])


class MedianTests(unittest.TestCase):
    def test_median_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_median_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_median_empty_raises(self):
        with self.assertRaises(ValueError):
            median([])


if __name__ == "__main__":
    unittest.main()
