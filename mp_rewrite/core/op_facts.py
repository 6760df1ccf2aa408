"""Facts about op types that several parts of the package need, each stated once."""

# Ops that change state: a signature running one cannot be frozen (its effect would be lost or wrong).
MUTATING_OPS = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "Assign", "AssignAdd", "AssignSub",
    "ResourceScatterUpdate", "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul", "ResourceScatterDiv",
    "ResourceScatterMin", "ResourceScatterMax", "ResourceScatterNdUpdate", "ResourceScatterNdAdd", "ScatterUpdate",
    "ScatterAdd", "ScatterNdUpdate", "DestroyResourceOp", "LookupTableInsertV2", "LookupTableRemoveV2",
    # Sets a variable's copy-on-read mode for good; tf.train.Checkpoint.write in a signature reads every variable so.
    "DisableCopyOnRead"})

# Contractions whose constant filter can take a per-output-channel scale (BatchNorm folding).
CONTRACTIONS = ("Conv2D", "DepthwiseConv2dNative", "MatMul")
