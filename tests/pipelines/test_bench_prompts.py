"""The benchmarks' prompt flags (benchmarks/harness/models.py): --domain picks a run's prompts by domain."""
import argparse

import datasets

from benchmarks.harness.models import load_prompts


def test_domain_all_takes_the_prompts_of_every_domain_and_a_domain_its_own(tiny_run):
    def prompts(domain):
        args = argparse.Namespace(target=str(tiny_run / "target"), prompt_set=str(tiny_run / "prompts" / "sets"),
                                  domain=domain, n_prompts=1000)
        return load_prompts(args, vocab=300)

    every = prompts("all")
    assert every == prompts(None)
    domains = sorted(set(datasets.load_from_disk(str(tiny_run / "prompts" / "sets"))["test"]["domain"]))
    assert len(domains) > 1
    by_domain = [prompts(d) for d in domains]
    assert all(by_domain) and sum(map(len, by_domain)) == len(every)
