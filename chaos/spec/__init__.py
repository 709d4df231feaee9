"""What a run asks for: the scenario file and its bounds, the latency models, the fault plan drawn
from the seed, aimed faults, the documents, the machine's capacity."""
