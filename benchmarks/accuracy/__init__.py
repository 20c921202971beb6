"""Small-object accuracy: the model matrix and its variants, the very-tiny suite, the FFM switch, checks of a run."""
