"""Analyses of graphs the front ends share: static shapes, FLOP estimates, running a GraphDef, comparing outputs."""
