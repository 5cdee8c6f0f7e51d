"""When requests arrive: the arrival process of vLLM's serving benchmark.

The first request arrives at 0; each later one follows the one before it after
a gap drawn from Gamma(shape=burstiness, scale=1 / (request_rate * burstiness)).
The mean gap is 1 / request_rate whatever the burstiness; burstiness 1 is a
Poisson process (exponential gaps), below 1 burstier, above 1 more regular.
A rate of inf puts every request at 0 (an offline batch)."""
import math
import random

from tracengine.errors import TracengineError


def check_rate(rate: float) -> float:
    """A request rate from the command line: a positive number or inf."""
    if not rate > 0:       # NaN too
        raise TracengineError(f"--request-rate expects a positive number or inf, got {rate!r}")
    return rate


def arrival_times(num_requests: int, request_rate: float = math.inf, burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Arrival times in seconds from the start of the run, non-decreasing, seeded."""
    if not request_rate > 0 or math.isnan(request_rate):
        raise TracengineError(f"request rate must be positive (or inf), got {request_rate!r}")
    if not burstiness > 0 or math.isinf(burstiness):
        raise TracengineError(f"burstiness must be a positive number, got {burstiness!r}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    # Its own stream, so that the same seed gives the same prompts with or without a rate.
    rng = random.Random(f"arrivals:{seed}")
    scale = 1.0 / (request_rate * burstiness)
    times, t = [], 0.0
    for _ in range(num_requests):
        times.append(t)
        t += rng.gammavariate(burstiness, scale)
    return times
