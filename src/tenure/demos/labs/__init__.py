"""The live labs of the dashboard (gateway/ui/labs.py runs them): seed 000's three experiments on real processes.

    python -m tenure.demos.labs loop  --dir DIR --params '{"jobs": 4, "block_ms": 300, "blocks": 6}'
    python -m tenure.demos.labs owner --dir DIR --params '{"short_jobs": 6}'
    python -m tenure.demos.labs lease --dir DIR --params '{"limit": 4, "crash_rate": 0.3, "seconds": 20}'

Each makes a throw-away SQLite store in DIR, starts `tenure worker` processes on it with the lab agents
(`tenure.demos.labs.agents:app`), drives them through the public Python API (`tenure.connect`) and prints one JSON
object a line (`info`, `sample`, `event`, `result`). Every worker runs in the lab's own process group and is
killed when the lab ends, whatever ends it.
"""
