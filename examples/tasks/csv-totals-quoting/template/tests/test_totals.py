import os
import tempfile
import unittest

from totals import totals_by


def write_csv(text):
    handle, path = tempfile.mkstemp(suffix=".csv")
    with os.fdopen(handle, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return path


class TotalsByTests(unittest.TestCase):
    def test_simple_file(self):
        path = write_csv("team,amount\na,1.5\nb,2\na,3\n")
        self.assertEqual(totals_by(path, "team", "amount"), {"a": 4.5, "b": 2.0})

    def test_quoted_fields_with_commas(self):
        path = write_csv('who,team,amount\n"Doe, J",a,1\n"Roe, R",b,2\n')
        self.assertEqual(totals_by(path, "team", "amount"), {"a": 1.0, "b": 2.0})

    def test_blank_lines_are_skipped(self):
        path = write_csv("team,amount\na,1\n\nb,2\n\n")
        self.assertEqual(totals_by(path, "team", "amount"), {"a": 1.0, "b": 2.0})


if __name__ == "__main__":
    unittest.main()
