"""A tiny calculator: the code under test of swerl's plain-unittest red-team project."""


def add(a, b):
    return a + b


def mean(values):
    return sum(values) / len(values)
