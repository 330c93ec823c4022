import unittest

from slug import slugify


class SlugifyTests(unittest.TestCase):
    def test_lowercases_and_joins_words(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_punctuation_runs_become_one_hyphen(self):
        self.assertEqual(slugify("What's new -- in Python 3.12?"), "what-s-new-in-python-3-12")

    def test_accents_are_folded(self):
        self.assertEqual(slugify("Crème Brûlée"), "creme-brulee")

    def test_long_titles_are_cut_between_words(self):
        self.assertEqual(slugify("one two three four", max_length=12), "one-two")

    def test_empty_title(self):
        self.assertEqual(slugify("!!!"), "untitled")


if __name__ == "__main__":
    unittest.main()
