"""A stand-in for an installed CuTe DSL library (tests only): the patterns of quack and
FlashAttention-4 that cutedebug must see through, written for the tests (see pipeline.py)."""
