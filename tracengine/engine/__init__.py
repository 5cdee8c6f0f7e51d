"""The engine core: sequences, the block manager, the scheduler, the step loop and `LLM`.
The scheduler, block manager, sequence and config import no torch and do no I/O."""
