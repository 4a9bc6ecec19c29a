/* test_link_sample.c - specification of examples/link_sample.c's counting (issue 37: how a host's
   link spends its time on the test bed): the /proc/net/tcp parser and the three classes of an
   interval. The tool is included whole (it needs only libc). */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#define LINK_SAMPLE_NO_MAIN
#include "../examples/link_sample.c"
#include "unity.h"

void setUp(void) {}
void tearDown(void) {}

#define HEADER "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

static void test_tcp_queued_sums_the_tx_queue_column(void) {
    const char *table = HEADER
        "   0: 0100000A:9470 0200000A:A2C5 01 000DF178:00000000 01:00000014 00000000     0        0 1 1 0 20 4 30 10 -1\n"
        "   1: 0100000A:B14A 0300000A:1F90 01 00000000:00000400 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1\n"
        "   2: 0100000A:1F90 00000000:0000 0A 00000010:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1\n";
    TEST_ASSERT_TRUE(ls_tcp_queued(table) == 0xDF178 + 0x10);
}

static void test_tcp_queued_of_no_sockets_is_zero(void) {
    TEST_ASSERT_TRUE(ls_tcp_queued(HEADER) == 0);
    TEST_ASSERT_TRUE(ls_tcp_queued("") == 0);
}

static void test_tcp_queued_refuses_what_does_not_parse(void) {
    TEST_ASSERT_TRUE(ls_tcp_queued(HEADER "   0: 0100000A:9470 0200000A:A2C5 01\n") == -1);
    TEST_ASSERT_TRUE(ls_tcp_queued(HEADER "garbage\n") == -1);
    TEST_ASSERT_TRUE(ls_tcp_queued(HEADER "   0: a b 01 zz:00\n") == -1);
    /* more than any socket can hold */
    TEST_ASSERT_TRUE(ls_tcp_queued(HEADER "   0: a b 01 FFFFFFFFFFFF:00000000\n") == -1);
}

static void test_share_of_the_rate(void) {
    /* 10 ms at 100 Mbit/s = 125,000 bytes */
    TEST_ASSERT_TRUE(ls_share(125000, 0.01, 1e8) > 0.999 && ls_share(125000, 0.01, 1e8) < 1.001);
    TEST_ASSERT_TRUE(ls_share(25000, 0.01, 1e8) > 0.199 && ls_share(25000, 0.01, 1e8) < 0.201);
    TEST_ASSERT_TRUE(ls_share(5000, 0, 1e8) == 0); /* (no time passed: no share) */
    TEST_ASSERT_TRUE(ls_share(5000, 0.01, 0) == 0);
}

static void test_count_classes_an_interval(void) {
    ls_counts c = {0, 0, 0, 0};
    ls_count(&c, 1.0, -1);   /* all of the rate: busy, the sockets not asked */
    ls_count(&c, 0.5, -1);   /* half: busy */
    ls_count(&c, 0.3, -1);   /* between: none of the three */
    ls_count(&c, 0.01, 0);   /* next to nothing, nothing held: idle */
    ls_count(&c, 0, 2000);   /* nothing sent, bytes held: waiting */
    ls_count(&c, 0.19, 1);   /* ... */
    ls_count(&c, 0, -1);     /* the table unreadable: none of the three */
    TEST_ASSERT_EQUAL_INT(2, (int)c.busy);
    TEST_ASSERT_EQUAL_INT(1, (int)c.idle);
    TEST_ASSERT_EQUAL_INT(2, (int)c.waiting);
    TEST_ASSERT_EQUAL_INT(7, (int)c.total);
}

int main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_tcp_queued_sums_the_tx_queue_column);
    RUN_TEST(test_tcp_queued_of_no_sockets_is_zero);
    RUN_TEST(test_tcp_queued_refuses_what_does_not_parse);
    RUN_TEST(test_share_of_the_rate);
    RUN_TEST(test_count_classes_an_interval);
    return UNITY_END();
}
