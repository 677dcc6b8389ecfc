"""python -m oar_opset check OPS_YAML | json OPS_YAML OPS_JSON: check the op set, or package it as JSON."""
import sys

from oar_opset.load import OpsetError, load, write_json


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "check":
        opset = load(argv[1])
        print(f"{argv[1]}: {len(opset)} ops, schema_version {opset.schema_version}: valid")
        return 0
    if len(argv) == 3 and argv[0] == "json":
        write_json(argv[1], argv[2])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OpsetError, OSError) as error:
        print(f"oar_opset: {error}", file=sys.stderr)
        sys.exit(2)
