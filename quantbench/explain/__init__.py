"""Explain a divergence: where (localize), which kernels ran (evidence), why (saturation lint), what fixes it
(remedy matrix), against which noise floor (noise), and at what cost (latency and memory). The report section
their tables make is quantbench.report.explainsection's."""
