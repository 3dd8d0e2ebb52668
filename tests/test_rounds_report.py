"""The rounds' report (tools/rounds_report.py): the person's labels to a finished folder counts only the
rounds whose promise held, and each order is set against random order on the same starting labels."""
from tools.rounds_report import finish_table, finished_at, promise_table, rest_within, shift_table


def round_(labels, unlabeled, accepted, accepted_error, labels_error=20.0):
    return dict(labels=labels, unlabeled=unlabeled, accepted=accepted, accepted_error=accepted_error,
                labels_error=labels_error)


def run(order, per_round, draw, rounds):
    return dict(order=order, per_round=per_round, draw=draw, rounds=rounds)


def test_a_round_that_broke_the_promise_finishes_nothing():
    rounds = [round_(0, 1000, 500, 3.0), round_(50, 950, 900, 6.0), round_(100, 900, 700, 4.0)]
    # 0 + 500 left; the second would be 50 + 50 but accepted 6% wrong; the third 100 + 200
    assert finished_at(run("least-confident", 50, 1, rounds), 5.0) == 300


def test_the_rest_within_the_error_is_the_first_round_whose_unlabeled_images_were_that_wrong_at_most():
    rounds = [round_(0, 100, 0, 0.0, 9.0), round_(10, 90, 0, 0.0, 5.0), round_(20, 80, 0, 0.0, 3.0)]
    assert rest_within(run("least-confident", 10, 1, rounds), 5.0) == 10
    assert rest_within(run("least-confident", 10, 1, rounds[:1]), 5.0) is None


def test_orders_are_paired_with_random_by_draw_and_at_the_nearest_round_size_said_so():
    record = dict(unlabeled=1000, max_error=5.0, runs=[
        run("random", 50, 1, [round_(0, 1000, 200, 2.0)]),   # 800
        run("random", 50, 2, [round_(0, 1000, 600, 2.0)]),   # 400
        run("least-confident", 50, 1, [round_(0, 1000, 200, 2.0), round_(50, 950, 550, 2.0)]),  # 450
        run("least-confident", 50, 2, [round_(0, 1000, 600, 2.0), round_(50, 950, 750, 2.0)]),  # 250
        run("least-confident", 10, 1, [round_(0, 1000, 200, 2.0), round_(10, 990, 590, 2.0)]),  # 410
        run("least-confident", 10, 2, [round_(0, 1000, 600, 2.0), round_(10, 990, 790, 2.0)])])  # 210
    rows = {tuple(c.strip() for c in line.split("|")[2:4]): line.split("|")[:-1]
            for line in finish_table({"f": record}).splitlines()[2:]}
    # 450 / 800 - 1 = -43.75%, 250 / 400 - 1 = -37.5%: mean -40.6, se 3.1
    assert rows[("least-confident", "50")][-2].strip() == "-41% ± 3"
    # 410 / 800 - 1 = -48.75%, 210 / 400 - 1 = -47.5%
    assert rows[("least-confident", "10")][-2].strip() == "-48% ± 1 (random at 50 a round)"
    assert rows[("random", "50")][-2].strip() == "-"
    assert rows[("random", "50")][-1].strip() == "- (0 of 2)"  # no round's rest was 5% wrong or less


def test_the_promise_table_counts_the_rounds_that_accepted_more_than_the_error_asked():
    record = dict(unlabeled=100, max_error=5.0, runs=[
        run("random", 50, 1, [round_(0, 100, 0, 0.0), round_(50, 50, 40, 5.5), round_(100, 0, 10, 5.0)])])
    assert "| f | 3 | 2 | 1 (50.0%) | 5.50% |" in promise_table({"f": record})


def test_the_shift_table_sets_the_images_proportions_against_the_held_out_ones_where_the_shift_was_seen():
    def shifted(seen, accepted, before, before_error):
        return dict(round_(0, 100, accepted, 1.0), shift_seen=seen,
                    before={"held-out proportions": [before, before_error]})
    record = dict(unlabeled=100, max_error=5.0, runs=[run("least-confident", 10, 1, [
        shifted(True, 60, 50, 1.0), shifted(True, 40, 45, 2.0), shifted(True, 30, 70, 6.0), shifted(False, 0, 0, 0.0)])])
    line = shift_table({"f": record}).splitlines()[-1]
    # now 60, 40, 30 of 100 (43.3%), the other 50, 45, 70 (55.0%); fewer in two rounds, one where it held (5)
    assert line == "| f | 3 (4) | 43.3% | 55.0% | 1.00% / 3.39% | 1 (5) | 0 / 1 |"
    assert shift_table({"f": dict(record, runs=[run("random", 10, 1, [round_(0, 100, 0, 0.0)])])}).count("\n") == 1
