"""Evaluation: takes trained weights and encoded splits, and gives losses, token accuracy, translations
(greedy or beam search in a compiled loop) and their BLEU and chrF from sacrebleu."""
