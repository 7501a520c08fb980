/* tests/nt_test.h - what every cmocka test file of ntensor sets up.
 * Include after <cmocka.h> and "ntensor.h". */
#ifndef NT_TEST_H
#define NT_TEST_H

#include <stdio.h>
#include <stdlib.h>

/* A fresh runtime per test, with no error left over. */
static inline int nt_test_setup(void **state)
{
    (void)state;
    assert_int_equal(nt_init(), 0);
    nt_clear_error();
    return 0;
}

static inline int nt_test_teardown(void **state)
{
    (void)state;
    nt_shutdown();
    return 0;
}

/* A private directory under /tmp for a group's files (checkpoints). */
static char nt_test_dir[256];

static inline int nt_test_dir_make(const char *tag)
{
    snprintf(nt_test_dir, sizeof nt_test_dir, "/tmp/nt_test_%s_XXXXXX", tag);
    return mkdtemp(nt_test_dir) ? 0 : -1;
}

static inline int nt_test_dir_remove(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", nt_test_dir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
