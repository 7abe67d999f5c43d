"""Step-time models checked against measured GPU timings (issue 35).

- :mod:`radixkv.clock.vidur`: read Vidur's measured operator timings;
- :mod:`radixkv.clock.error`: the measured error of the step-time models' token-parallel
  term, and the fit of the ``fitted`` roofline;
- :mod:`radixkv.clock.calibrated`: :class:`CalibratedCostModel` (``fitted``, ``profiled``,
  a profile file) and :func:`cost_model`, the chooser of ``--cost-model``;
- :mod:`radixkv.clock.build`: the packaged data files from Vidur's data.
"""
from radixkv.clock.calibrated import CalibratedCostModel, cost_model

__all__ = ["CalibratedCostModel", "cost_model"]
