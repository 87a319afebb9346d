"""fsdurable benchmarks: startup, discovery, commit, cost growth and memory, each against the floor
(the same work done with nothing but the stdlib) and against what users would pick instead.

Run everything:   ``python -m bench``           (full run, minutes; writes bench/results/)
Smoke run:        ``python -m bench --quick``   (under 60 s; writes bench/results/tmp/quick/)
One part:         ``python -m bench.discovery`` (likewise startup, commit, growth, memory)
Tables and plots: ``python -m bench.report``    (bench/README.md and PNGs from the JSON)

Every contender of a figure is timed in the same run, interleaved round by round, so a noisy
neighbour slows them all alike; results are medians, p90 and p99 with the sample count.
"""
