"""``radixkv plan``: the cheapest deployment that meets a latency SLO on a trace.

* :mod:`radixkv.plan.spec`        the question: SLO, GPUs, prices, search space (CLI or TOML)
* :mod:`radixkv.plan.candidates`  a deployment (:class:`Point`), its knobs' neighbours, its
                                  command lines (engine, ``radixkv replay``, sweep cell)
* :mod:`radixkv.plan.prune`       memory feasibility and the roofline's throughput bound
* :mod:`radixkv.plan.evaluate`    points replayed as sweep cells, judged against the SLO
* :mod:`radixkv.plan.search`      the search (:func:`make_plan`)
* :mod:`radixkv.plan.report`      text table, JSON document, Pareto plot

Data flows one way: spec → candidates → prune → evaluate → search → report.
"""
from radixkv.plan.candidates import Point
from radixkv.plan.search import NoFeasiblePlan, PlanResult, make_plan
from radixkv.plan.spec import PlanSpec, load_spec, parse_prices, parse_slo

__all__ = ["NoFeasiblePlan", "PlanResult", "PlanSpec", "Point", "load_spec", "make_plan", "parse_prices",
           "parse_slo"]
