"""Recipes: declarative experiment grids in ``recipes/*.yaml``.

A recipe names cells; each cell expands over the cartesian product of its
list-valued axes (``task``, ``backbone``, ``init``, ``seeds``, train's
``layers``, ``finetune`` and ``lr``) into concrete *runs*. Every run has a
stable id, used as its results folder under the output directory::

    name: listops-depth                    # default: the file's stem; letters, digits, '.', '_', '-'
    description: ListOps, output layer only, by depth
    defaults: {backbone: minilm, seeds: [0]}   # any cell key; applied where it fits the cell's kind
    cells:
      - kind: fit-linear                   # fit-linear | train | fit-raw | bench
        task: listops                      # or a list of tasks
        task_params: {n_train: 4000, n_test: 1000}   # over defaults' task_params (those its tasks take)
        init: [pretrained, random]
        layers: 6                          # store depth K (layers 0..K are extracted once)
        fit_layers: all                    # all | K | [0, 3, 6]: readouts fitted from the store
        readout: logistic                  # logistic | ridge, or both as a list
      - kind: train
        task: bit-xor
        init: [pretrained, random]
        finetune: fpt                      # fpt | all | output | comma list of groups
        steps: 1000
        lr: 1.0e-3                         # or a list, or lr_sweep: "1e-6:1e-2:9" (seeds = the sweep's seeds)
      - {kind: fit-raw, task: digits}      # the no-backbone baseline
      - {kind: fit-linear, task: data, task_params: {path: digits.npz}, layers: 2}   # a data file (--data)
    paper:                                 # the paper's numbers, in percent, found by a row's label
      - {match: {task: listops, init: pretrained, layer: 6}, value: 33.0, source: "Lu et al. Table 12 (GPT-2)"}

Cell keys by kind (:data:`KIND_KEYS`): every kind takes ``kind, task,
task_params, seeds, tag``; fit-linear adds ``backbone, init, layers,
fit_layers, readout, dtype, amp, batch_size, projection``; train adds ``backbone, init, layers,
finetune, lr, lr_sweep, steps, epochs, batch_size, eval_every, dropout, amp, projection``
(``amp`` as ``--amp``: ``auto`` computes in bf16 on CUDA and on CPUs with native
bf16, ``none`` in float32; ``projection`` as ``--projection``: ``orthogonal`` or ``normal``);
fit-raw adds ``readout``; bench (cached vs live training cost, as
``reservoir bench speedup``) adds ``backbone, init, layers, batch_size,
split_layer, max_live_rows``. ``seeds`` are seed values (``0`` or ``[0, 1,
2]``), seeding the backbone init, the projection, the head and the validation
split; the data's own seed is a task parameter. A data file is the task ``data`` with
``task_params: {path: ...}`` (a relative path is read from the recipe's folder; run ids and report rows
name it ``data-<file stem>``). A ``backbone`` that is a model folder is read as ``--backbone`` reads it: a
relative folder from the working folder ``recipe run`` is started in, as a recipe may name a hub id too.
Defaults' ``task_params`` serve the cells whose tasks take them; one that only some of a cell's tasks
take is refused (the cell's tasks share one ``task_params``: split the cell by task). ``tag`` names a
variant (e.g. other task parameters) so that its runs get distinct ids; like the recipe's
``name`` it becomes part of a folder name, so both are letters, digits, ``.``,
``_`` and ``-`` only (not ``.`` or ``..``), at most 64 characters; a recipe expands to at most
10,000 runs. A train cell takes ``steps`` or ``epochs``, not both; either one set in the cell replaces
both of the defaults'. ``null`` stands for the default only where it has one (``steps``, ``epochs``,
``batch_size``, ``split_layer``). Numbers are held to the bounds
``reservoir train`` applies (:data:`reservoir.training.BOUNDS`: ``lr`` > 0,
``steps`` >= 1, ``dropout`` in [0, 1), ...), ``task_params`` are checked as the task's builder checks them
(``n_train`` an integer >= 1, ...) without building it, every list axis names at least one value, and
``readout`` and ``fit_layers`` name each value once. A key written twice in one mapping is refused (YAML would
keep the last silently). A paper entry's
``match`` keys are row-label keys (:data:`LABEL_KEYS`); ``layer`` is the
readout's depth (fit-linear: the fitted layer; train and bench: ``layers``).
Its ``metric`` (:data:`METRICS`) says what ``value`` is: test accuracy in
percent (default), ``steps_to_converge`` of a train row (Lu et al. Table 6) or
the per-epoch ``speedup`` of a bench row (Table 10), each checked to be one (a percentage in [0, 100], steps in
[0, 1e12], a ratio above 0); its ``source`` is one line, and the ``description`` holds no control characters
but line breaks and tabs. Unknown keys anywhere are refused with one line naming the key and the allowed ones.

Running a recipe (:func:`run_recipe`) writes ``<out>/recipe.yaml`` (and ``recipe-source.json``: the folder its
relative data paths were taken from, where ``report`` takes them from too) and one folder per run: fit-linear ``<readout>-layer<k>.json`` per fitted layer,
fit-raw ``<readout>.json``, train ``results.json`` (plus checkpoints), an lr
sweep ``sweep.json``, bench ``speedup.json``, and in each ``recipe-run.json``, the settings (and data digest)
the run began with, so that an interrupted run is resumed only by the same cell; each results file records its
run's id and settings (:meth:`Run.settings`). Runs whose results exist with the recipe's current settings are skipped (``force``
redoes them); results of another run, of this run before its cell was edited, or of a task read from files
whose data changed since (its recorded fingerprint, :func:`~reservoir.recipes.state.data_fingerprint`), are
computed again. Every path the runner writes or removes is resolved first and refused unless it lies inside the
output (or cache) folder, so neither an id nor a symbolic link can send a write, or ``force``'s removal,
elsewhere. fit-linear stores live at ``<cache_dir>/<hash12>.zarr``, the hash taken
over everything in the store key (task fingerprint, backbone, init, seed,
depth, dtype, compute dtype, projection kind and gain); a complete store whose provenance matches is
reused, an unfinished one is resumed.
"""

from reservoir.recipes.files import list_recipes, load_recipe, recipes_dir
from reservoir.recipes.runner import plan, run_recipe, store_for
from reservoir.recipes.runs import Run, fitted_layers
from reservoir.recipes.schema import KIND_KEYS, KINDS, LABEL_KEYS, METRICS, Cell, PaperValue, Recipe
from reservoir.recipes.state import result_files

__all__ = [
    "KINDS", "KIND_KEYS", "LABEL_KEYS", "METRICS", "Cell", "PaperValue", "Recipe", "Run", "fitted_layers",
    "list_recipes", "load_recipe", "plan", "recipes_dir", "result_files", "run_recipe", "store_for",
]
