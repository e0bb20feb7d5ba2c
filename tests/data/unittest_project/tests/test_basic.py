import unittest

import calc


class BasicTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(calc.mean([1, 2, 3]), 2)

    def test_mean_of_one(self):
        """The mean of one value is that value."""
        self.assertEqual(calc.mean([5]), 5)
