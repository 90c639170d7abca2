//! The civil date and time a chat template's `strftime_now(format)` formats ([`ChatTime`]): a proleptic Gregorian
//! calendar and Python's `strftime` directives in the C locale, for [`crate::chat::ChatTemplate`].

use std::fmt::Write as _;

use specrt_core::{Result, SpecError};

/// A civil date and time (no time zone), the moment `strftime_now` formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatTime {
    /// Year, e.g. 2024.
    pub year: i32,
    /// Month, 1 to 12.
    pub month: u32,
    /// Day of the month, 1 to 31.
    pub day: u32,
    /// Hour, 0 to 23.
    pub hour: u32,
    /// Minute, 0 to 59.
    pub minute: u32,
    /// Second, 0 to 59.
    pub second: u32,
}

impl ChatTime {
    /// A checked date and time.
    ///
    /// # Errors
    /// [`SpecError::Config`] naming the field out of range (month 1..=12, day within the month, hour 0..=23,
    /// minute and second 0..=59, year 1..=9999 as Python's `datetime`).
    pub fn new(
        year: i32,
        month: u32,
        day: u32,
        hour: u32,
        minute: u32,
        second: u32,
    ) -> Result<Self> {
        let bad = |what: &str, v: i64, range: &str| {
            Err(SpecError::Config(format!(
                "strftime_now time: {what} {v} is invalid (expected {range})"
            )))
        };
        if !(1..=9999).contains(&year) {
            return bad("year", i64::from(year), "1..=9999");
        }
        if !(1..=12).contains(&month) {
            return bad("month", i64::from(month), "1..=12");
        }
        let dim = days_in_month(year, month);
        if day < 1 || day > dim {
            return bad("day", i64::from(day), &format!("1..={dim}"));
        }
        if hour > 23 {
            return bad("hour", i64::from(hour), "0..=23");
        }
        if minute > 59 {
            return bad("minute", i64::from(minute), "0..=59");
        }
        if second > 59 {
            return bad("second", i64::from(second), "0..=59");
        }
        Ok(Self {
            year,
            month,
            day,
            hour,
            minute,
            second,
        })
    }

    /// The current time in UTC (transformers takes the local time; the two agree where the zone is UTC).
    #[must_use]
    pub fn now_utc() -> Self {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
        let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
        let rem = secs.rem_euclid(86_400);
        // rem < 86400: the casts are exact.
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        Self {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
        }
    }

    /// Day of the week, 0 = Monday .. 6 = Sunday (Python's `weekday()`).
    fn weekday(self) -> u32 {
        // 1970-01-01 was a Thursday (3).
        let d = days_from_civil(self.year, self.month, self.day);
        // rem_euclid(7) is in 0..7.
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        let w = (d + 3).rem_euclid(7) as u32;
        w
    }

    /// Day of the year, 1 to 366.
    fn yearday(self) -> u32 {
        (1..self.month)
            .map(|m| days_in_month(self.year, m))
            .sum::<u32>()
            + self.day
    }

    /// `strftime(format)` with Python's (glibc's) C-locale directives: `%a %A %b %B %c %d %e %H %I %j %m %M %p %S
    /// %U %W %w %x %X %y %Y %C %D %F %T %R %h %n %t %u %%` and the `-` flag (`%-d`: no padding); `%Z` / `%z` are
    /// empty (a naive datetime); any other directive is written as it is.
    #[must_use]
    pub fn strftime(self, format: &str) -> String {
        const DAYS: [&str; 7] = [
            "Monday",
            "Tuesday",
            "Wednesday",
            "Thursday",
            "Friday",
            "Saturday",
            "Sunday",
        ];
        const MONTHS: [&str; 12] = [
            "January",
            "February",
            "March",
            "April",
            "May",
            "June",
            "July",
            "August",
            "September",
            "October",
            "November",
            "December",
        ];
        let mut out = String::new();
        let mut chars = format.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let no_pad = chars.peek() == Some(&'-');
            if no_pad {
                chars.next();
            }
            let Some(d) = chars.next() else {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                break;
            };
            let num = |out: &mut String, v: i64, width: usize| {
                if no_pad {
                    let _ = write!(out, "{v}");
                } else {
                    let _ = write!(out, "{v:0width$}");
                }
            };
            let wd = self.weekday() as usize;
            let month_name = MONTHS[(self.month - 1) as usize];
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            match d {
                'a' => out.push_str(&DAYS[wd][..3]),
                'A' => out.push_str(DAYS[wd]),
                'b' | 'h' => out.push_str(&month_name[..3]),
                'B' => out.push_str(month_name),
                'd' => num(&mut out, i64::from(self.day), 2),
                'e' => {
                    let _ = write!(out, "{:>2}", self.day);
                }
                'H' => num(&mut out, i64::from(self.hour), 2),
                'I' => num(&mut out, i64::from(hour12), 2),
                'j' => num(&mut out, i64::from(self.yearday()), 3),
                'm' => num(&mut out, i64::from(self.month), 2),
                'M' => num(&mut out, i64::from(self.minute), 2),
                'S' => num(&mut out, i64::from(self.second), 2),
                'p' => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                'y' => num(&mut out, i64::from(self.year % 100), 2),
                'Y' => {
                    let _ = write!(out, "{}", self.year);
                }
                'C' => num(&mut out, i64::from(self.year / 100), 2),
                'u' => {
                    let _ = write!(out, "{}", wd + 1);
                }
                'w' => {
                    let _ = write!(out, "{}", (wd + 1) % 7);
                }
                'U' | 'W' => {
                    // Week of the year: weeks start on Sunday (%U) or Monday (%W); days before the first are week 0.
                    let yday = i64::from(self.yearday()) - 1;
                    let first = if d == 'U' {
                        i64::try_from((wd + 1) % 7).unwrap_or(0)
                    } else {
                        i64::try_from(wd).unwrap_or(0)
                    };
                    num(&mut out, (yday + 7 - first) / 7, 2);
                }
                'D' | 'x' => {
                    let _ = write!(
                        out,
                        "{:02}/{:02}/{:02}",
                        self.month,
                        self.day,
                        self.year % 100
                    );
                }
                'F' => {
                    let _ = write!(out, "{}-{:02}-{:02}", self.year, self.month, self.day);
                }
                'T' | 'X' => {
                    let _ = write!(
                        out,
                        "{:02}:{:02}:{:02}",
                        self.hour, self.minute, self.second
                    );
                }
                'R' => {
                    let _ = write!(out, "{:02}:{:02}", self.hour, self.minute);
                }
                'c' => {
                    let _ = write!(
                        out,
                        "{} {} {:>2} {:02}:{:02}:{:02} {}",
                        &DAYS[wd][..3],
                        &month_name[..3],
                        self.day,
                        self.hour,
                        self.minute,
                        self.second,
                        self.year
                    );
                }
                'n' => out.push('\n'),
                't' => out.push('\t'),
                '%' => out.push('%'),
                'Z' | 'z' => {}
                other => {
                    out.push('%');
                    if no_pad {
                        out.push('-');
                    }
                    out.push(other);
                }
            }
        }
        out
    }
}

fn is_leap(year: i32) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i32, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    // Days in range of SystemTime: every value fits.
    #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
    (y as i32, m as u32, d as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_round_trip() {
        for days in [-1_000_000, -1, 0, 1, 19_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
    }
}
