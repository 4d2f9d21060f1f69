"""A module that takes 1.5 s to import: a worker's start must not count against a call's deadline."""
import time

time.sleep(1.5)


def double(x):
    return 2 * x
