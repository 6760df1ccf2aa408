"""Reading models: SavedModel directories, GraphDef and MetaGraphDef files, Keras `.keras` / tf_keras `.h5` files;
choosing MetaGraphs by tag-set and checking signature keys. Every command, the converter and the guard read models
through this package, so a path, a tag-set or a signature key means the same thing everywhere.

    files.py       the proto files: a SavedModel's saved_model.pb(txt), GraphDef / MetaGraphDef files
    tags.py        tag-sets: parsing "serve,gpu", choosing MetaGraphs, refusing an ambiguous choice
    signatures.py  signature keys: listing, checking and choosing them
    keras_file.py  .keras / .h5 files, exported to a SavedModel the way `model.export` does
    loaded.py      a model read for inspection: one graph, its fetches and what Grappler preserves for it
"""
