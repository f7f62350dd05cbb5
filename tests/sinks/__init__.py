"""Sink tier: one room per prebuilt sink (``sinks/<name>/``), and here the tests of several."""
