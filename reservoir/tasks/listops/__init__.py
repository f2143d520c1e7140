"""ListOps (Long Range Arena): nested MIN/MAX/MED/SM expressions over digits.

``[MAX 4 3 [MIN 2 3 ] 1 0 ]`` evaluates to 4; the task is to predict the value
(10 classes) of an expression read as a token sequence.

- :mod:`~reservoir.tasks.listops.language`: trees, their values and text, the
  ``lra`` and ``fpt`` tokenizations and their fixed vocabularies.
- :mod:`~reservoir.tasks.listops.generate`: the LRA generator, step for step
  from a seeded ``random.Random``, and generated splits drawn in parallel.
- :mod:`~reservoir.tasks.listops.lra`: the LRA release files
  ``basic_{train,val,test}.tsv``.
- :mod:`~reservoir.tasks.listops.task`: the registered ``listops`` task.
"""

from reservoir.tasks.arrays import encode
from reservoir.tasks.listops.generate import (
    BLOCK_ROWS,
    MAX_ARGS,
    MAX_DEPTH,
    MAX_REJECTIONS,
    VALUE_P,
    draw_ids,
    generate_split,
    generate_tree,
    sample_trees,
)
from reservoir.tasks.listops.language import (
    CLOSE,
    DIGITS,
    FPT_MAX_TOKENS,
    FPT_VOCAB,
    LRA_VOCAB,
    OPERATORS,
    Tree,
    evaluate,
    to_string,
    tokenize_fpt,
    tokenize_lra,
    tree_tokens,
)
from reservoir.tasks.listops.lra import HEADER, SPLIT_FILES, read_lra_split
from reservoir.tasks.listops.task import build_listops

__all__ = ["BLOCK_ROWS", "CLOSE", "DIGITS", "FPT_MAX_TOKENS", "FPT_VOCAB", "HEADER", "LRA_VOCAB", "MAX_ARGS",
           "MAX_DEPTH", "MAX_REJECTIONS", "OPERATORS", "SPLIT_FILES", "VALUE_P", "Tree", "build_listops", "draw_ids",
           "encode", "evaluate", "generate_split", "generate_tree", "read_lra_split", "sample_trees", "to_string",
           "tokenize_fpt", "tokenize_lra", "tree_tokens"]  # fmt: skip
