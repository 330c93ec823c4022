import unittest

from pager import page_count, paginate

ITEMS = list(range(1, 26))  # 25 products


class PaginateTests(unittest.TestCase):
    def test_first_page_starts_at_first_item(self):
        self.assertEqual(paginate(ITEMS, 1, 10), list(range(1, 11)))

    def test_last_partial_page(self):
        self.assertEqual(paginate(ITEMS, 3, 10), [21, 22, 23, 24, 25])

    def test_page_past_the_end_is_empty(self):
        self.assertEqual(paginate(ITEMS, 4, 10), [])

    def test_page_zero_is_rejected(self):
        with self.assertRaises(ValueError):
            paginate(ITEMS, 0, 10)


class PageCountTests(unittest.TestCase):
    def test_partial_last_page_counts(self):
        self.assertEqual(page_count(25, 10), 3)

    def test_exact_multiple(self):
        self.assertEqual(page_count(20, 10), 2)

    def test_no_items_no_pages(self):
        self.assertEqual(page_count(0, 10), 0)


if __name__ == "__main__":
    unittest.main()
