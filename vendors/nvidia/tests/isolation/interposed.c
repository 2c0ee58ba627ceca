/* interposed.c: libinterposed.so, a library that defines hami_probe, for the RTLD_NEXT check of test_lookup.py. */
int hami_probe(void) { return 1; }
