"""`python -m specdraft.pipelines.evaluate CONFIG`: the evaluate stage alone, as `specdraft evaluate`."""
from specdraft.pipelines.cli import stage_main

stage_main("evaluate")
