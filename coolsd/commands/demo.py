"""`coolsd demo`: the main job."""
from __future__ import annotations


def register(sub):
    d = sub.add_parser("demo", help="the main job")
    d.set_defaults(func=run)


def run(args):
    from coolsd.commands.theory import default_verifiers, format_table, theory_table
    from theory import chains

    print("coolsd demo: the end-to-end real-model demo is not built yet; exact theory on a default chain:")
    P, Q = chains.ambiguous_pair(8, spread=0.5, tv=0.4, seed=0)
    print(format_table(theory_table(P, Q, 4, default_verifiers(8, 4))))
