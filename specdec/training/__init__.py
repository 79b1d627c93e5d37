"""Training EAGLE and Medusa heads on a CPU by self-distillation (`specdec train`).

corpus.py builds token windows from text that ships on the machine (Python sources, package
documentation) plus answers the target writes itself; features.py runs the target once over them and
caches its features and top predictions; train.py fits a head to those and measures it.
"""
