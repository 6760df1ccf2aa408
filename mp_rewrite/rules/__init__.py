"""Graph rewrite rules as data, GraphDef in, GraphDef out: each a pattern, its replacement, its conditions and the
reason it declines. They write Keras graphs the way TensorFlow's CPU remapper fuses them (MatMul/Conv + BiasAdd +
activation), fold BatchNormalization into the contraction before it, and fold the Casts of constants. In a traced
training step, batchnorm_training.fuse_training_batch_norms fuses Keras 3's BatchNormalization and its gradient into
FusedBatchNormV3 and FusedBatchNormGradV3.

    canonicalize(graph_def, fetches) -> (new GraphDef, [Record])
    fusion_groups(graph_def) -> [FusionGroup]   (node-name sets a precision pass keeps in one precision)

TensorFlow is imported only when a rule reads a constant.
"""

from .batchnorm import fold_batch_norms, fold_batch_norms_recorded
from .batchnorm_training import fuse_training_batch_norms
from .canonical import FLOAT32_RULES, PLACEMENT_RULES, RULES, Rule, canonicalize
from .constants import check_weights_low, fold_constant_casts
from .fusion import FusionGroup, fusion_groups
from .record import Match, Record

__all__ = ["canonicalize", "fusion_groups", "FusionGroup", "Record", "Match", "Rule", "RULES", "FLOAT32_RULES", "PLACEMENT_RULES", "fold_batch_norms",
           "fold_batch_norms_recorded", "fold_constant_casts", "check_weights_low", "fuse_training_batch_norms"]
