"""Small trained heads that draft from the target's own hidden states (EAGLE, Medusa).

eagle.py / medusa.py: the modules; target_parts.py: the target's embeddings and LM head rows they
reuse; checkpoint.py: saving and loading heads tied to one target; the drafters that run them are
in specdec.drafters, their training in specdec.training.
"""
