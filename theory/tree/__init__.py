"""theory.tree: draft trees. Static shapes and per-round trees (``shapes``: ``Tree``, ``RowTrees``, EAGLE_25 / EAGLE_57,
``parse_tree``), multi-candidate verification (``verify``: ``verify_tree``, T5 applied recursively, section 9), the
candidate keys of dynamic trees (``dynamic``, section 10) and the exact law of one tree round on small Markov chains
(``exact``: ``tree_round``).

May import: ``theory.core``, ``theory.rules``.
"""
from .dynamic import GUIDES, KEYS, child_keys, guided_children, rank_guide, select_nodes
from .exact import TreeRound, tree_round
from .shapes import EAGLE_25, EAGLE_57, RowTrees, Tree, chain_tree, parse_tree, row_trees, truncate_tree
from .verify import DRAFT_LAWS, TreeVerdict, draft_without_replacement, verify_round, verify_tree

__all__ = ["Tree", "RowTrees", "row_trees", "TreeVerdict", "verify_tree", "draft_without_replacement", "EAGLE_25",
           "EAGLE_57", "verify_round", "tree_round", "TreeRound", "chain_tree", "DRAFT_LAWS", "parse_tree", "truncate_tree", "KEYS",
           "child_keys", "guided_children", "rank_guide", "select_nodes", "GUIDES"]
