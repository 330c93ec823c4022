import unittest

from signup import Signup, ValidationError, parse_signup

GOOD = {"username": "Ada_L", "email": " Ada@Example.org ", "age": 36}


class ParseSignupTests(unittest.TestCase):
    def test_valid_payload_is_normalised(self):
        self.assertEqual(parse_signup(GOOD), Signup("ada_l", "ada@example.org", 36, False))

    def test_age_must_be_a_real_int(self):
        for age in ("36", 36.0, True):
            with self.subTest(age=age), self.assertRaises(ValidationError) as caught:
                parse_signup({**GOOD, "age": age})
            self.assertEqual(caught.exception.field, "age")

    def test_missing_email(self):
        payload = {k: v for k, v in GOOD.items() if k != "email"}
        with self.assertRaises(ValidationError) as caught:
            parse_signup(payload)
        self.assertEqual(caught.exception.field, "email")


if __name__ == "__main__":
    unittest.main()
