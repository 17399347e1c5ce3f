"""Each optimizer algorithm written once, framework-neutral (layer 2 of DESIGN.md): options, state,
checkpoint schema and step sequencing. Imports no framework; the faces call into it."""
