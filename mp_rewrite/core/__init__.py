"""The pass: GraphDef (and function library) in, mixed precision GraphDef out. Imports nothing of the package but errors."""
