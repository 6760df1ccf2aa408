"""Reasons in words: one phrase per rule key of mp_rewrite.core.stages (and rewrite.why_kept), filled from the Reason."""

from __future__ import annotations


# rule -> template; {source}, {via}, {detail} and {op} are filled in. Rules not listed render their detail.
PHRASES = {
    "allow_list": "allow list",
    "user_force_low": "forced to low precision (force_low)",
    "unsafe_force_all": "level UNSAFE_FORCE_ALL",
    "deny_list": "deny list",
    "user_keep_fp32": "kept float32 by the user (keep_fp32)",
    "position_angle": "computes the angle of {source} from integer positions: kept float32",
    "deny_propagated": "deny propagated from {source}",
    "between_allow": "between allow nodes ({detail})",
    "follows_allow": "infer op directly after allow node {source}",
    "allow_through_clear": "clear op connected to allow node {source}",
    "not_processed": "not processed: {detail}",
    "not_float32": "not float32 ({detail})",
    "not_in_lists": "in no op list",
    "no_low_precision_kernel": "{detail}",
    "no_allow_neighbour": "clear op not connected to a low-precision node",
    "not_between_allow": "infer op neither between allow nodes nor directly after one",
}
KEPT_RULES = ("not_processed", "not_float32", "not_in_lists", "no_low_precision_kernel", "no_allow_neighbour",
              "not_between_allow", "dtype_not_allowed", "quantized", "recurrent_edge_match")


def reason_text(reason) -> str:
    """One phrase for a Reason ("deny propagated from loss/Log", "allow list", ...)."""
    template = PHRASES.get(reason.rule)
    if template is None:
        return reason.detail or reason.rule.replace("_", " ")
    return template.format(source=reason.source or "?", via=reason.via or "?", detail=reason.detail)
