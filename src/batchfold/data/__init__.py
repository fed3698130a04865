"""Data loaders: SST trees, word vectors, CoNLL-U treebanks, molecules, random structures."""
