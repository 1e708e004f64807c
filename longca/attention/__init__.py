"""The attention model: what is computed, independent of how or where it is measured.

Masks as slices (``masks``), packed-document sampling (``varlen``), a mask's block-sparse and dense
forms (``mask_convert``), one problem's shapes and inputs (``problem``), its FLOPs (``flops``) and
the exact answer every kernel is checked against (``reference``); ``errors`` holds ``MaskError``,
which masks, varlen and mask_convert raise.  Nothing here imports the kernels, the CP strategies,
the execution of cells or the results side.
"""
