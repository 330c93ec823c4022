import unittest

from ini import IniError, parse_ini


class ParseIniTests(unittest.TestCase):
    def test_sections_and_keys(self):
        text = "[server]\nhost = example.org\nport: 8443\n"
        self.assertEqual(parse_ini(text), {"server": {"host": "example.org", "port": "8443"}})

    def test_comments_and_blank_lines_are_ignored(self):
        text = "; top\n\n[a]\n  # indented comment\nx = 1\n"
        self.assertEqual(parse_ini(text), {"a": {"x": "1"}})

    def test_keys_are_lowercased(self):
        self.assertEqual(parse_ini("[a]\nLog_Level = info\n"), {"a": {"log_level": "info"}})

    def test_key_outside_section_is_an_error(self):
        with self.assertRaises(IniError) as caught:
            parse_ini("x = 1\n")
        self.assertTrue(str(caught.exception).startswith("line 1:"))

    def test_sample_file(self):
        with open("deploy.ini", encoding="utf-8") as f:
            parsed = parse_ini(f.read())
        self.assertEqual(parsed["worker"]["queue"], "jobs=high # not a comment")


if __name__ == "__main__":
    unittest.main()
