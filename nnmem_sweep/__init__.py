"""nnmem_sweep: GPU-memory capacity planner.

Data flows one way: load_scenario -> expand_grid -> add_components -> fits -> build_context -> render.
"""
__version__ = "0.1.0"
