import unittest
from datetime import datetime, timezone

from logparse import LogRecord, count_by_level, parse_line


class ParseLineTests(unittest.TestCase):
    def test_parses_a_well_formed_line(self):
        record = parse_line("2024-05-01T12:00:03Z ERROR [billing] Payment declined: card=4242\n")
        self.assertEqual(
            record,
            LogRecord(
                timestamp=datetime(2024, 5, 1, 12, 0, 3, tzinfo=timezone.utc),
                level="ERROR",
                component="billing",
                message="Payment declined: card=4242",
            ),
        )

    def test_rejects_other_formats(self):
        self.assertIsNone(parse_line("Traceback (most recent call last):"))
        self.assertIsNone(parse_line("2024-05-01 12:00:06 INFO [api] old format line"))


class CountByLevelTests(unittest.TestCase):
    def test_counts_the_sample_log(self):
        with open("app.log", encoding="utf-8") as f:
            counts = count_by_level(f)
        self.assertEqual(counts, {"INFO": 2, "DEBUG": 1, "ERROR": 2, "WARNING": 1})


if __name__ == "__main__":
    unittest.main()
