from radixkv.cli import entry

entry()
